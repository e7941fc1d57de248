"""WebDataset-style tar shards as a data source (in progress: local shards so far)."""

from .indexfile import ShardIndex, build_index, index_path, open_index, read_wids_descriptor
from .s3 import S3Options
from .shardset import SampleRef, ShardSet, default_cache_dir, expand_urls
from .tarindex import Member, Sample, ShardFormatError, group_samples, scan_members
from .writer import ShardWriter

__all__ = [
    "Member", "S3Options", "Sample", "SampleRef", "ShardFormatError", "ShardIndex", "ShardSet", "ShardWriter",
    "build_index", "default_cache_dir", "expand_urls", "group_samples", "index_path", "open_index", "read_wids_descriptor", "scan_members",
]

from .build import (BuildError, BuildReport, SourceSample, build_shards, samples_from_files, samples_from_folder,
                    samples_from_list, samples_from_manifest)

__all__ += [
    "BuildError", "BuildReport", "SourceSample", "build_shards", "samples_from_files", "samples_from_folder",
    "samples_from_list", "samples_from_manifest",
]
