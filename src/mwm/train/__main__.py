"""``python -m mwm.train``: train one run (:func:`mwm.train.cli.main`)."""

import sys

from mwm.train.cli import main

sys.exit(main())
