"""Client2Vec's math against brute force: losses by hand, eq. 1 by a loop, eq. 3 against the simplex."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from p2pfl.core.client2vec import (
    DSAIGN,
    ClientIndex,
    DSAIGNConfig,
    IndexTraining,
    aggregation_objective,
    aggregation_weights,
    client_index,
    cohort_similarity,
    cosine,
    distillation,
    draw_without_replacement,
    exclusion_window,
    group_separation,
    loss_div,
    loss_orth,
    loss_recon,
    loss_sim,
    orthogonality_to_indices,
    sampling_probabilities,
    similarity_matrix,
    train_dsa_ign,
)

SMALL = DSAIGNConfig(embed_dim=16, d_model=8, heads=2, layers=1, ff_dim=32, dropout=0.0)


def test_loss_div_of_identical_indices_is_log_b_minus_1_plus_1() -> None:
    for b in (2, 5, 17):
        u = torch.ones(b, 6) * 3.0
        assert float(loss_div(u)) == pytest.approx(math.log(b - 1) + 1.0, rel=1e-6)


def test_losses_against_explicit_loops() -> None:
    g = torch.Generator().manual_seed(0)
    z, u, lab, d, rec = (torch.randn(5, 4, generator=g) for _ in range(5))
    cos = lambda a, b: float(a @ b / (a.norm() * b.norm()))  # noqa: E731
    div = sum(math.log(sum(math.exp(cos(u[j], u[k])) for k in range(5) if k != j)) for j in range(5)) / 5
    assert float(loss_div(u)) == pytest.approx(div, rel=1e-5)
    assert float(loss_sim(z, lab)) == pytest.approx(sum(1 - cos(z[j], lab[j]) for j in range(5)) / 5, rel=1e-5)
    raw = sum(abs(float(z[j] @ u[k])) for j in range(5) for k in range(5))
    assert float(loss_orth(z, u, "raw")) == pytest.approx(raw, rel=1e-5)
    cosine_mean = sum(abs(cos(z[j], u[k])) for j in range(5) for k in range(5)) / 25
    assert float(loss_orth(z, u, "cosine")) == pytest.approx(cosine_mean, rel=1e-5)
    square_mean = sum(cos(z[j], u[k]) ** 2 for j in range(5) for k in range(5)) / 25
    assert float(loss_orth(z, u, "cosine2")) == pytest.approx(square_mean, rel=1e-5)
    assert float(loss_recon(rec, d)) == pytest.approx(float(((rec - d) ** 2).mean()), rel=1e-6)
    with pytest.raises(ValueError, match="orth"):
        loss_orth(z, u, "l2")
    with pytest.raises(ValueError, match="2 samples"):
        loss_div(u[:1])


def test_without_positional_embedding_z_equals_u_and_with_it_they_differ() -> None:
    d = F.normalize(torch.randn(6, 16, generator=torch.Generator().manual_seed(1)), dim=1)
    torch.manual_seed(0)
    paper = DSAIGN(DSAIGNConfig(**{**SMALL.__dict__, "positional": False})).eval()
    z, u = paper.decompose(d)
    assert torch.equal(z, u)
    torch.manual_seed(0)
    ours = DSAIGN(SMALL).eval()
    z, u = ours.decompose(d)
    assert (z - u).abs().max() > 1e-3
    assert ours(d)[2].shape == d.shape


def test_config_rejects_shapes_that_do_not_tile() -> None:
    with pytest.raises(ValueError, match="multiple of d_model"):
        DSAIGNConfig(embed_dim=10, d_model=8)
    with pytest.raises(ValueError, match="multiple of heads"):
        DSAIGNConfig(embed_dim=16, d_model=8, heads=3)
    with pytest.raises(ValueError, match="losses"):
        DSAIGNConfig(losses=("sim", "kl"))
    with pytest.raises(ValueError, match="orth"):
        DSAIGNConfig(orth="l1")


def test_training_lowers_the_objective_and_duplicated_samples_leave_the_index_unchanged() -> None:
    g = torch.Generator().manual_seed(2)
    labels = F.normalize(torch.randn(3, 16, generator=g), dim=1)
    y = torch.randint(0, 3, (64,), generator=g)
    d = F.normalize(labels[y] + 0.3 * torch.randn(64, 16, generator=g), dim=1)
    torch.manual_seed(0)
    model = DSAIGN(SMALL)
    from p2pfl.core.client2vec import dsa_ign_losses

    def objective() -> float:
        model.eval()
        with torch.no_grad():
            return float(sum(dsa_ign_losses(model, d, labels[y]).values()))

    before = objective()
    log = train_dsa_ign(model, d, labels[y], IndexTraining(epochs=30, batch_size=16), generator=g)
    assert log.steps == 30 * 4 and set(log.last) == {"div", "sim", "orth", "recon"}
    assert objective() < before
    once = client_index(model, d, labels[y])
    twice = client_index(model, torch.cat([d, d]), torch.cat([labels[y], labels[y]]))
    torch.testing.assert_close(once.feature, twice.feature, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(once.label, twice.label)
    assert once.full.shape == (32,)


def test_cosine_of_a_zero_vector_is_zero_and_the_matrix_is_symmetric() -> None:
    assert cosine(torch.zeros(3), torch.ones(3)) == 0.0
    vs = [torch.tensor([1.0, 0.0]), torch.tensor([1.0, 1.0]), torch.zeros(2)]
    s = similarity_matrix(vs)
    assert s[0, 1] == pytest.approx(1 / math.sqrt(2)) and np.allclose(s, s.T) and s[2, 2] == 0.0


def _indices(n: int, dim: int, seed: int) -> dict[str, ClientIndex]:
    g = torch.Generator().manual_seed(seed)
    return {f"node-{i}": ClientIndex(torch.randn(dim, generator=g), torch.rand(dim, generator=g)) for i in range(n)}


def test_cohort_similarity_is_the_sample_weighted_mean_of_both_cosines() -> None:
    idx = _indices(5, 6, 3)
    sizes = {k: 10 * (i + 1) for i, k in enumerate(idx)}
    cohort = ["node-1", "node-3"]
    by_hand = sum(sizes[j] * (cosine(idx["node-0"].feature, idx[j].feature) + cosine(idx["node-0"].label, idx[j].label))
                  for j in cohort) / (2 * (sizes["node-1"] + sizes["node-3"]))
    assert cohort_similarity(idx, sizes, cohort, "node-0") == pytest.approx(by_hand)
    assert cohort_similarity(idx, sizes, ["node-2"], "node-2") == pytest.approx(1.0)


def test_eq1_against_a_loop_window_and_temperature() -> None:
    sims = {"a": 0.9, "b": 0.1, "c": -0.4, "d": 0.5}
    tau = 0.5
    probs = sampling_probabilities(sims, tau, excluded={"d"})
    open_ = ["a", "b", "c"]
    z = sum(math.exp(sims[k] / tau) for k in open_)
    for k in open_:
        assert probs[k] == pytest.approx(math.exp(sims[k] / tau) / z)
    assert probs["d"] == 0.0 and sum(probs.values()) == pytest.approx(1.0)
    hot = sampling_probabilities(sims, 1e6)
    assert all(p == pytest.approx(0.25, abs=1e-5) for p in hot.values())
    assert sampling_probabilities(sims, 1.0, excluded=set(sims)) == sampling_probabilities(sims, 1.0)
    assert exclusion_window(10, 2) == 2 and exclusion_window(10, 3) == 1 and exclusion_window(4, 3) == 0
    with pytest.raises(ValueError, match="tau"):
        sampling_probabilities(sims, 0.0)


def test_draws_are_without_replacement_and_follow_the_probabilities() -> None:
    rng = np.random.default_rng(0)
    probs = {"a": 0.7, "b": 0.3, "c": 0.0}
    draws = [draw_without_replacement(probs, 2, rng) for _ in range(50)]
    assert all(sorted(d) == ["a", "b"] for d in draws)
    firsts = [draw_without_replacement(probs, 1, rng)[0] for _ in range(2000)]
    assert firsts.count("a") / 2000 == pytest.approx(0.7, abs=0.04)


def test_eq3_maximises_eq2_on_the_simplex_and_tends_to_the_prior() -> None:
    rng = np.random.default_rng(4)
    names = ["a", "b", "c", "d"]
    history = dict(zip(names, rng.normal(size=4).tolist()))
    prior = dict(zip(names, (rng.random(4) + 0.1).tolist()))
    total = sum(prior.values())
    prior = {k: v / total for k, v in prior.items()}
    h, q = np.array(list(history.values())), np.array(list(prior.values()))
    for heat in (0.1, 1.0, 5.0):
        p = aggregation_weights(history, prior, heat)
        best = aggregation_objective(np.array([p[k] for k in names]), h, q, heat)
        for point in rng.dirichlet(np.ones(4), size=500):
            assert aggregation_objective(point, h, q, heat) <= best + 1e-12
    far = aggregation_weights(history, prior, 1e6)
    assert all(far[k] == pytest.approx(prior[k], abs=1e-5) for k in names)
    with pytest.raises(ValueError, match="heat"):
        aggregation_weights(history, prior, 0.0)


def test_eq4_terms() -> None:
    g = torch.Generator().manual_seed(5)
    zp, bf = torch.randn(4, 3, generator=g), torch.randn(3, 6, generator=g)
    unit = bf / bf.norm(dim=0, keepdim=True)
    raw = float(orthogonality_to_indices(zp, bf, "raw"))
    assert raw == pytest.approx(float((zp @ unit).abs().mean()), rel=1e-6)
    cosines = [abs(cosine(zp[j], bf[:, k])) for j in range(4) for k in range(6)]
    assert float(orthogonality_to_indices(zp, bf)) == pytest.approx(sum(cosines) / len(cosines), rel=1e-6)
    squares = [c * c for c in cosines]
    assert float(orthogonality_to_indices(zp, bf, "cosine2")) == pytest.approx(sum(squares) / len(squares), rel=1e-6)
    assert float(orthogonality_to_indices(0.01 * zp, bf, "cosine2")) == pytest.approx(sum(squares) / len(squares), rel=1e-5)
    # smooth at the optimum: the gradient of cos² vanishes where z_P is orthogonal to B^f, |cos|'s does not
    ortho = torch.tensor([[1.0, 0.0, 0.0]], requires_grad=True)
    basis = torch.tensor([[0.0], [1.0], [0.0]])
    orthogonality_to_indices(ortho, basis, "cosine2").backward()
    assert float(ortho.grad.abs().max()) == 0.0
    # Shrinking z lowers the printed form but not the cosine one: only turning z_P away from B^f does.
    assert float(orthogonality_to_indices(0.01 * zp, bf, "raw")) == pytest.approx(0.01 * raw, rel=1e-5)
    assert float(orthogonality_to_indices(0.01 * zp, bf)) == pytest.approx(float(orthogonality_to_indices(zp, bf)), rel=1e-5)
    with pytest.raises(ValueError, match="orth must be one of"):
        orthogonality_to_indices(zp, bf, "l2")
    logits = torch.randn(4, 5, generator=g)
    assert float(distillation(logits, logits)) == pytest.approx(0.0, abs=1e-7)
    p, q = F.softmax(logits, 1), F.softmax(logits.flip(1), 1)
    assert float(distillation(logits, logits.flip(1))) == pytest.approx(float((p * (p / q).log()).sum(1).mean()), rel=1e-5)


def test_federated_training_is_fedavg_of_local_runs() -> None:
    from p2pfl.core.client2vec import federated_dsa_ign

    g = torch.Generator().manual_seed(6)
    data = [(F.normalize(torch.randn(n, 16, generator=g), dim=1), F.normalize(torch.randn(n, 16, generator=g), dim=1))
            for n in (12, 20, 8)]
    training = IndexTraining(epochs=2, batch_size=8)
    torch.manual_seed(0)
    model = DSAIGN(SMALL)
    start = copy.deepcopy(model)
    chosen = federated_dsa_ign(model, data, rounds=1, fraction=0.5, training=training,
                               rng=np.random.default_rng(1), generator=torch.Generator().manual_seed(2))
    assert len(chosen) == 1 and len(chosen[0]) == 2
    # by hand: the same two local runs, in the same order, with the same generator stream
    gen = torch.Generator().manual_seed(2)
    states, sizes = [], []
    for i in chosen[0]:
        local = copy.deepcopy(start)
        train_dsa_ign(local, *data[i], training, generator=gen)
        states.append(local.state_dict())
        sizes.append(len(data[i][0]))
    for key, value in model.state_dict().items():
        expected = sum(s[key] * n for s, n in zip(states, sizes)) / sum(sizes)
        torch.testing.assert_close(value, expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="fraction"):
        federated_dsa_ign(model, data, rounds=1, fraction=0.0, training=training, rng=np.random.default_rng(0))


def test_the_balanced_feature_index_ignores_label_proportions() -> None:
    g = torch.Generator().manual_seed(7)
    labels = F.normalize(torch.randn(3, 16, generator=g), dim=1)
    y = torch.arange(3).repeat(10)
    d = F.normalize(torch.randn(30, 16, generator=g), dim=1)
    torch.manual_seed(0)
    model = DSAIGN(SMALL).eval()
    # the same samples with class 0 five times over: the proportions change, the classes do not
    heavy = torch.cat([d] + [d[y == 0]] * 4)
    heavy_y = torch.cat([y] + [y[y == 0]] * 4)
    a = client_index(model, d, labels[y], "balanced")
    b = client_index(model, heavy, labels[heavy_y], "balanced")
    torch.testing.assert_close(a.feature, b.feature, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(client_index(model, d, labels[y]).feature, client_index(model, heavy, labels[heavy_y]).feature)
    with pytest.raises(ValueError, match="feature_mean"):
        client_index(model, d, labels[y], "median")


def test_group_separation_by_hand() -> None:
    # a, b in group x; c in group y. cos(a, b) = 1, cos(a, c) = 0, cos(b, c) = 0.6
    a, b, c = np.array([1.0, 0.0]), np.array([2.0, 0.0]), np.array([0.0, 1.0])
    sep = group_separation([a, b, c], ["x", "x", "y"])
    assert sep.same == pytest.approx(1.0) and sep.cross == pytest.approx(0.0) and sep.gap == pytest.approx(1.0)
    assert sep.nearest_in_group == 2 and sep.nodes == 3  # c's nearest (a tie at 0) is in another group
    d = np.array([0.8, 0.6])  # cos(a, d) = 0.8, cos(c, d) = 0.6
    sep = group_separation([a, d, c], ["x", "y", "y"])
    assert sep.same == pytest.approx(0.6) and sep.cross == pytest.approx((0.8 + 0.0) / 2)
    assert sep.nearest_in_group == 1  # a -> d (other group), d -> a (other group), c -> d (own group)
    with pytest.raises(ValueError, match="at least one group with two nodes"):
        group_separation([a, c], ["x", "y"])
