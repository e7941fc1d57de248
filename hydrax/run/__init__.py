"""The Dataloader and the collaborators that carry one run.

Arguments are checked (:mod:`~hydrax.run.arguments`) and the run settled once
(:mod:`~hydrax.run.plan`); the :mod:`~hydrax.run.engine` starts the machinery; the
:mod:`~hydrax.run.pipeline` thread walks the schedule, hands tasks to the workers and turns
finished slots into batches (:mod:`~hydrax.run.assembly`, :mod:`~hydrax.run.placement`,
:mod:`~hydrax.run.batch`); the :mod:`~hydrax.run.loader` hands them out. Nothing is re-exported
here: the public names are :mod:`hydrax`'s.
"""
