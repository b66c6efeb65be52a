"""``python -m pyfleet.trainer RUN_DIR/job.json``: run this process's role of the job."""

import sys

from pyfleet.trainer.role import main

if __name__ == "__main__":
    sys.exit(main())
