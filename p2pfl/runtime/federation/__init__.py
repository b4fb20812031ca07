"""A federation that grows from one address: membership by certificate instead of a roster file.

The layers, from the bottom:

* `certificates`: the operator's federation key signs certificates (a member's id and key, until
  when) and revocation lists; pure checks that name why a member is refused.
* `records`: a member's signed, timestamped record of itself (id, address, certificate).
* `directory`: the members one node knows, the newest revocations, who was refused and why.
* `gossip`: the one exchange over HTTP that discovery from seeds, periodic gossip and the
  flooding of revocations all use.
* `service`: runs beside a node (a companion of `p2pfl.runtime.node`): admits members into its
  carrier and neighbour table while it runs, and takes revoked or expired ones out.
* `config`: the `[federation]` table of a node's config; `operator`: what `p2pfl federation
  init / admit / revoke / status` do.
"""
