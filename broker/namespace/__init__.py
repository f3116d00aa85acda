"""Namespaces: tenants, policies, bundles, ownership and lookup (Pulsar's ``broker/namespace``).

Role: the administrative state above topics and which broker serves which topic. Inside:

- ``service.py``: ``NamespaceService`` (``BrokerService.namespaces``), the one door to all of
  it: tenants, namespaces and their policies, a topic's own policies, lookups and bundles;
- ``namespaces.py``: tenants and namespace policies documents in the metadata store;
- ``policies.py``: what each namespace policy may hold (the one check every transport relies
  on); ``persistence.py``: the ``persistence`` policy (ensemble and quorums);
  ``topic_policies.py``: the policies a topic sets for itself over its namespace's;
- ``bundles.py``: a namespace's hash ranges (Pulsar's ``NamespaceBundles``);
- ``ownership.py``: ``OwnershipManager``, the cluster half of Pulsar's ``NamespaceService``:
  lookups that assign bundles, unload, split, and what a lost ZooKeeper session does;
  ``ownership_cache.py``: the bundles this broker owns through ephemeral znodes (Pulsar's
  ``OwnershipCache``); ``load_manager.py``: load reports and the assignment of unowned bundles
  to the least-loaded live broker; ``bounded_zookeeper.py``: their kazoo calls, bounded in time;
- ``lookup.py``: the answer of a lookup, for any transport.

It has no front door of its own: the broker's face (``broker/__init__.py``) re-exports what the
edges use, and ``ownership.py`` (which loads kazoo, as the modules it builds on do) is imported
only by ``broker/cluster.py`` (``service.py`` names its types for annotations only).
"""
