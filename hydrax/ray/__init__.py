"""hydrax on a Ray cluster (``pip install 'hydrax[ray]'``; see the guide "Scaling out with Ray").

- :func:`serve_on_ray`: producers as Ray actors, each serving a share of one run to the trainer's
  :class:`Source`, every batch once and in order, restarted by Ray when they die.
- :func:`build_shards_on_ray`: a shard build split over Ray tasks, the same shards byte for byte
  as :func:`hydrax.shards.build.build_shards` writes.
- :func:`index_files_on_ray`, :func:`publish_indexes_on_ray`: shard indexes written by Ray tasks,
  beside local shards or as objects beside remote ones.
"""

from .building import build_shards_on_ray
from .indexing import index_files_on_ray, publish_indexes_on_ray
from .serving import Producer, Source, serve_on_ray

__all__ = ["Producer", "Source", "build_shards_on_ray", "index_files_on_ray", "publish_indexes_on_ray", "serve_on_ray"]
