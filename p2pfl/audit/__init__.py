"""Privacy measured: what an honest-but-curious node can learn from the parts it read during a run.

    seat.py        what the node holds: the parts its records say it read, its own data and models
    membership.py  membership inference (a loss attack; ART's black-box attack on shadow models)
    inversion.py   model inversion (ART's MIFace) and update inversion (Geiping et al. 2020)
    run.py         `p2pfl audit RUN --node ID`: every peer, every attack, RUN/audit.json
    figure.py      RUN/report/audit.png

The figures of how well scores separate members from non-members, and the ε they prove, are
pure math in `p2pfl.core.leakage`. Needs the `audit` extra: pip install 'p2pfl-influence[audit]'.
"""
