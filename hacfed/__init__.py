"""hacfed: federated HACPO (Heterogeneous Agent Collaborative Policy Optimization).

Importing the package is cheap and torch-free; the math lives in ``hacfed.algorithm``
(torch), the torch-free pieces the coordinator needs in ``hacfed.hacpo_config``,
``hacfed.capability``, ``hacfed.trajectory`` and ``hacfed.messages``.
"""

__version__ = "0.1.0"
