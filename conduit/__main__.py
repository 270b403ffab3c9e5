import sys

from conduit.cli import main

sys.exit(main())
