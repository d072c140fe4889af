import sys

from dynfuse.cli import main

sys.exit(main())
