"""WebDataset-style tar shards as a data source: local, S3, GCS and HTTP(S), indexed for random access."""

from .indexfile import IndexResult, ShardIndex, build_index, index_file, index_path, open_index
from .catalog import default_cache_dir
from .listing import expand_urls
from .manifest import read_manifest, write_manifest
from .publish import publish_indexes, write_summaries
from .shardtable import ShardEntry
from .readahead.options import ReadAhead
from .shardset import SampleRef, ShardSet
from .router import store_for
from .options import GCSOptions, HFOptions, HTTPOptions, S3Options, StoreOptions
from .store import ObjectInfo, Store
from .wids import read_wids_descriptor
from .tarindex import Member, Sample, ShardFormatError, group_samples, scan_members
from .writer import ShardWriter

__all__ = [
    "GCSOptions", "HFOptions", "HTTPOptions", "IndexResult", "Member", "ObjectInfo", "ReadAhead", "S3Options", "Sample", "SampleRef", "ShardEntry",
    "ShardFormatError", "ShardIndex", "ShardSet", "ShardWriter", "Store", "StoreOptions", "build_index", "default_cache_dir",
    "expand_urls", "group_samples", "index_file", "index_path", "open_index", "publish_indexes", "read_manifest", "read_wids_descriptor",
    "scan_members", "store_for", "write_manifest", "write_summaries",
]

from .build import BuildReport, build_shards
from .build.sources import BuildError, SourceSample, samples_from_files, samples_from_folder, samples_from_list, samples_from_manifest

__all__ += [
    "BuildError", "BuildReport", "SourceSample", "build_shards", "samples_from_files", "samples_from_folder",
    "samples_from_list", "samples_from_manifest",
]
