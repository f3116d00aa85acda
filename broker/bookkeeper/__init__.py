"""The ledger client: BookKeeper's ``client`` and ``replication``, on the broker's side.

Role: everything between a managed ledger and the bookies that hold its entries. Inside:

- ``bookie.py``: the ``Bookie`` seam (the storage front door's shape), ``LocalBookie`` over an
  in-process ``LedgerStorage``, ``BookieClient`` (the bookies a broker can pick ensembles from),
  write sets and quorum sizes, and the stored entry's piggybacked header;
- ``ledger_manager.py``: ``LedgerManager`` (creates, opens and deletes ledgers);
- ``ledger_handle.py``: ``LedgerHandle`` (adds to a write set acknowledged by an ack quorum,
  reads, ensemble changes);
- ``ledger_recovery.py``: ``LedgerRecovery`` (fencing and closing a ledger left open);
- ``ledger_metadata.py``: ``LedgerMetadata`` (a ledger's state and fragments in the metadata
  store at ``/ledgers/{id}``);
- ``remote_bookie.py`` and ``bookie_network.py``: a ``magnetar bookie`` behind the same seam,
  over the bookie protocol (``storage/bookie_protocol.py``) on one asyncio loop thread;
- ``autorecovery.py``: re-replication of the entries a dead bookie held.

The bookie itself (the server side) is ``storage/``; this package is only its client. It has no
front door of its own: the broker's face and ``broker/cluster.py`` import its modules.
"""
