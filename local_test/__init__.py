# Lets tests and scripts import the local helpers: `from local_test import batch_transform`.
