import sys

from local_test.batch_transform.cli import main

sys.exit(main())
