"""One node as parts you can change (the rules below keep it so):

1. `Node` (lifecycle.py) holds nothing that changes every round: a `Round` (round.py) is made
   for each round and owns that round's state; a round's helpers take the round, not the node.
2. No module here imports lifecycle.py but this face: lower rooms receive what they need.
3. A round record's keys are declared once, in records.py.
4. One lifecycle stage (`Stage`), not flags; scores are small named dataclasses.
5. No file here is over 300 lines; `Node` has at most 15 attributes.
"""

from p2pfl.runtime.node.lifecycle import Node, RoundCallback
from p2pfl.runtime.node.parts import NodeParts
from p2pfl.runtime.node.records import RoundRecord, Stage

__all__ = ["Node", "NodeParts", "RoundCallback", "RoundRecord", "Stage"]
