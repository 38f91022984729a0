import sys

from animegamer.cli import main

sys.exit(main())
