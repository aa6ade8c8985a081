"""A short tour of the operator algebra (run: python examples/demo.py)."""

import jax
import jax.numpy as jnp

import linops as lo


def main() -> None:
    key_j, key_u = jax.random.split(jax.random.key(0))
    J = lo.Dense(jax.random.normal(key_j, (20, 50)))  # a wide "Jacobian"
    H = lo.Diagonal(jnp.linspace(0.5, 2.0, 20))  # output Hessian
    G = J.T @ H @ J  # a GGN-like curvature, lazy
    print("G = Jᵀ H J is tagged", sorted(G.tags), "by the congruence rule")

    posterior_precision = lo.shift(G, 1.0, nonnegative=True)
    sol = lo.solve(posterior_precision, jnp.ones(50), method="cg")
    print(f"CG solve: converged={bool(sol.converged)} in {int(sol.num_steps)} steps, "
          f"residual {float(sol.residual_norm):.2e}")

    P = lo.ProjectorOp.onto_null_space(J.matrix)
    print("rank of J:", int(P.rank), "| trace of the null-space projector:", float(lo.trace(P)))
    print("simplify(P @ P.T @ P) is P:", lo.simplify(P @ P.T @ P).signature() == P.signature())
    print(lo.explain(lo.Identity(50) @ (P @ P) @ G))

    U = jnp.linalg.qr(jax.random.normal(key_u, (50, 5)))[0]
    low_rank_plus_prior = lo.LowRank(U, jnp.arange(1.0, 6.0), orthonormal=True) + 2.0 * lo.Identity(50)
    print(f"logdet by the determinant lemma: {float(lo.logdet(low_rank_plus_prior)):.6f}, "
          f"dense: {float(jnp.linalg.slogdet(low_rank_plus_prior.as_matrix())[1]):.6f}")


if __name__ == "__main__":
    main()
