"""``python -m sparse2d.train.config --check CONFIG`` / ``--reference`` (``sparse2d config``)."""

import sys

from sparse2d.train.config import main

sys.exit(main())
