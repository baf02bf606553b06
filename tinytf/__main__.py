import sys

from tinytf.course.cli import main

sys.exit(main())
