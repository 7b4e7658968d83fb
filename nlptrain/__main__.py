import sys

from nlptrain.cli import main

sys.exit(main())
