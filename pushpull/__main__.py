import sys

from pushpull.cli import main

sys.exit(main())
