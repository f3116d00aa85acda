"""Tiered storage: closed ledgers copied to an object store, read back as if local.

``offloader.py`` names the seam (``LedgerOffloader``, ``OffloadContext``, ``ReadHandle``); the
managed ledger only ever talks to it, never to a driver.
"""
