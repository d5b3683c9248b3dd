import sys

from queue_daemon.cli import main

sys.exit(main())
