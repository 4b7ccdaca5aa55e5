"""python -m accumplan plan|export|report ...: the executable's planner commands (_core.main: its code, messages)."""
import sys

from . import _core

if __name__ == "__main__":
    sys.exit(_core.main(sys.argv[1:]))
