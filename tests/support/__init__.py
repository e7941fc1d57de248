"""What the tests use and are not tests themselves; imported as ``support.<module>``.

pytest puts ``tests/`` on ``sys.path`` (``tests/conftest.py`` belongs to no package), so this
package is importable from every test module, and from the worker processes they start, which
take the parent's ``sys.path``. The test modules stay flat in ``tests/``: the fork server preloads
them by their top-level names.

- ``proctable``: the live processes, from /proc (the leak checks of ``conftest.py``);
- ``shmwatch``: which /dev/shm entries this test run created (inotify), so that the leak checks
  never count other jobs' entries;
- ``timing``: ``slack(seconds)``, a time bound stretched by how slow and how loaded the machine
  is now; every upper bound on a time in the tests goes through it;
- ``fuzzing``: mutant counts and running a batch of mutants in a child (``test_fuzz_*.py``);
- ``netproxy``: a delaying, fault-injecting HTTP proxy, for the remote-shard tests and the
  benchmarks in ``tools/bench/``; also a script (``python tests/support/netproxy.py --help``);
- ``global_batches_job``: one process of a training job, run as a script by ``test_sharding.py``
  and ``test_cache.py``;
- ``serve_share_job``: one producer of a reliable serve, run as a script (and imported) by
  ``test_serve_reliable.py``;
- ``agreement_job``: one process of a two-process run driving the host agreement by hand, run
  as a script by ``test_hosts.py``;
- ``workbench``: an arena and a worker pool driven by hand with task records, and an engine
  without a Dataloader (``test_workers.py``, ``test_diagnosis.py``, ``test_assembly.py``,
  ``test_engine.py``, ``test_pipeline.py``);
- ``compat_scenario``, ``cache_scenario``: the differential scenarios that
  ``tools/compat/record_fixtures.py`` and ``record_cache_fixtures.py`` recorded under hydrax 0.2.2,
  replayed on ours by ``test_compat.py`` and ``test_cache_compat.py``.

Tools may use these modules; the tests never import anything from ``tools/``.
"""
