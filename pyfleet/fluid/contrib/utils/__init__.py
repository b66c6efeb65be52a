"""``fluid.contrib.utils``: ``lookup_table_utils`` and ``hdfs_utils``."""

from pyfleet.fluid.contrib.utils import hdfs_utils, lookup_table_utils
from pyfleet.fluid.contrib.utils.hdfs_utils import HDFSClient, multi_download, multi_upload
from pyfleet.fluid.contrib.utils.lookup_table_utils import (
    convert_dist_to_sparse_program,
    load_persistables_for_increment,
    load_persistables_for_inference,
)

__all__ = ["HDFSClient", "convert_dist_to_sparse_program", "hdfs_utils",
           "load_persistables_for_increment", "load_persistables_for_inference",
           "lookup_table_utils", "multi_download", "multi_upload"]
