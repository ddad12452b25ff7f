"""``python -m hotswitch.calibration``: see ``hotswitch.cli.calibration``."""

import sys

from hotswitch.cli.calibration import main

sys.exit(main())
