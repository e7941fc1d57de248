"""WebDataset-style tar shards as a data source (work in progress: the tar index is here)."""

from .tarindex import Member, Sample, ShardFormatError, group_samples, scan_members

__all__ = ["Member", "Sample", "ShardFormatError", "group_samples", "scan_members"]
