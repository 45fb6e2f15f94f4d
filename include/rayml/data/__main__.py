"""``python -m rayml.data``: run the stage from its importable module (see :func:`rayml.stage.main_of`)."""

import sys

from rayml.stage import main_of

if __name__ == "__main__":
    sys.exit(main_of("rayml.data.stage"))
