"""``python -m sparse2d.train --config configs/NAME.yaml [dotted.key=value ...]``."""

import sys

from sparse2d.train.main import main

sys.exit(main())
