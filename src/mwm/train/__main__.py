"""``python -m mwm.train``: train one run (:func:`mwm.train.loop.main`)."""

import sys

from mwm.train.loop import main

sys.exit(main())
