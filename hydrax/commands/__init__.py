"""The subcommands of the ``hydrax`` command, one module each.

Every module has ``register(subparsers)``, which adds its parser (with help, an example in the
epilog, and ``set_defaults(run=...)``); ``run(args)`` returns the exit status. The work itself
lives in the library (``hydrax.shards``, ``hydrax.image``), so the commands stay thin.
"""
