"""``python -m sparse2d.patches``: print the table of ``docs/patches.md``."""

from sparse2d.patches import table

print(table(), end="")
