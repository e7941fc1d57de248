"""WebDataset-style tar shards as a data source (in progress: the tar index and index files)."""

from .indexfile import ShardIndex, build_index, index_path, open_index, read_wids_descriptor
from .tarindex import Member, Sample, ShardFormatError, group_samples, scan_members

__all__ = [
    "Member", "Sample", "ShardFormatError", "ShardIndex",
    "build_index", "group_samples", "index_path", "open_index", "read_wids_descriptor", "scan_members",
]
