"""What rides DDP's gradient all-reduce at the end of the backward: a sync's NaN/inf vote
(``vote``: the carrier, and the early sync run right after it), and whole small syncs
folded into the same all-reduce (``fold``: the regions and slots; ``folding``: the sync
policy's side, when a cadence sync may fold and landing the average DDP brings back).
"""
