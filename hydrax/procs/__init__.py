"""The processes of a run and the memory they share.

How helper processes start (:mod:`~hydrax.procs.processes`: start method, fork server, parent
death), what the fork server preloads (:mod:`~hydrax.procs.forkserver`), whether a process
named in a file lives (:mod:`~hydrax.procs.liveness`), what crosses the process boundary
(:mod:`~hydrax.procs.messages`, :mod:`~hydrax.procs.pickling`), the worker loop
(:mod:`~hydrax.procs.workers`) and the shared arena its items go into
(:mod:`~hydrax.procs.arena`, page-locked by :mod:`~hydrax.procs.pinning`). Nothing here knows
about a Dataloader: the run layer (:mod:`hydrax.run`) drives it. Nothing is re-exported here.
"""
