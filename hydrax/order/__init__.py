"""Which batch comes next, which items it holds and which seeds they get.

Everything here is a pure function of a group's seed, the epoch and the position, or an object
built from such functions: no process, no I/O, no memory of size N unless an order must be
stored. :mod:`~hydrax.order.schedule` holds the plans, steps and shares;
:mod:`~hydrax.order.orders` says which item sits at a position; :mod:`~hydrax.order.orderbook`
keeps the stored orders a run needs; :mod:`~hydrax.order.permute` and
:mod:`~hydrax.order.mixing` are the lazy bijection and a mixture's layout they build on;
:mod:`~hydrax.order.mixture` is the ``Mixture`` data source. Nothing is re-exported here, so
importing one module does not import the others.
"""
