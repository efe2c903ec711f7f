"""Policy gradients with estimators of every order.

- `magic_box`, `dice_surrogate` (`estimators.py`): DiCE and Loaded DiCE, a scalar to be
  maximized whose derivatives of every order under nested tapes are unbiased estimates of
  the expected discounted return's.
- `discounted_returns`, `gae_advantages`, `LinearFeatureBaseline` (`returns.py`): returns,
  advantages and MAML's linear feature baseline on `[batch, T]` tensors.
- `CategoricalPolicy`, `GaussianPolicy` (`policies.py`): Keras models whose
  `distribution(observations, params=None)` is a `Categorical` or `DiagonalGaussian`
  (`log_prob`, stateless `sample(seed)`, `entropy`, `kl`); `params` substitutes tensors for
  the policy's variables through `hogrod.functional_call` (MAML's inner step).
- `TabularMDP`, `Navigation2D`, `IteratedPrisonersDilemma` (`envs.py`): environments as
  batched pure TensorFlow functions, `sample_tasks(seed, n)`, `reset(task, seed, batch)`,
  `step(task, state, action)`; `TASK_SAMPLING`, how `Navigation2D` and `HalfCheetahTasks`
  draw a meta-batch's goals (independent, or a Latin hypercube over the meta-batch).
- `rollout`, `Trajectories`, `policy_distribution` (`rollout.py`): a policy's episodes on
  a meta-batch of tasks, `[tasks, batch, T]`, one compiled loop over time.
- `gym_rollout`, `HalfCheetahTasks` (`gym.py`): the same `Trajectories` from a `gymnasium`
  vector environment stepped on the host (seeded as `rollout`), and MAML's HalfCheetah
  velocity and direction tasks (the optional extra `rl`: gymnasium, mujoco).
- `natural_step`, `line_search` (`trpo.py`): TRPO's step on Fisher-vector products and its
  backtracking line search; `MamlRL` (`maml_rl.py`): MAML-RL, rollouts, the inner step
  (`inner_step`, `maml_inner.py`: `hogrod.meta.adapt` on a DiCE objective) and a TRPO or
  clipped-surrogate outer step (`maml_outer.py`), the tasks mapped by `hogrod.taskmap`,
  under `tf.distribute`.
- `expected_return` (`exact.py`): the exact expected return of a tabular softmax policy on a
  small MDP, differentiable to every order: the oracle of the estimators.
- `make_lola_update`, `LolaParams`, `lola_dice_gradients`, `joint_dice_surrogates`
  (`lola.py`): LOLA-DiCE, two agents each ascending its DiCE surrogate through the other's
  predicted learning steps, on the iterated prisoner's dilemma (`inner_steps` = 0: naive
  learners), with the DiCE authors' value baseline or the batch mean; `sample_ipd`,
  `ipd_log_probs`, `ipd_values`, `fit_ipd_values`, `IPDTrajectories` (`ipd.py`): the
  game's tabular agents and value heads.

Conventions: a batch of trajectories is `[batch, T]` tensors (`log_probs`, `rewards`,
`values`, `mask`); `mask` is 1 before an episode ends and 0 after. Discounts and lambdas are
Python numbers applied at the tensors' dtype.
"""

from hogrod.rl.envs import TASK_SAMPLING, IteratedPrisonersDilemma, Navigation2D, TabularMDP
from hogrod.rl.estimators import dice_surrogate, magic_box
from hogrod.rl.exact import expected_return
from hogrod.rl.gym import HALFCHEETAH_TASKS, HalfCheetahTasks, gym_rollout
from hogrod.rl.ipd import (IPDTrajectories, fit_ipd_values, ipd_log_probs, ipd_values,
                           sample_ipd)
from hogrod.rl.lola import (LolaParams, joint_dice_surrogates, lola_dice_gradients,
                            make_lola_update)
from hogrod.rl.maml_inner import inner_step
from hogrod.rl.maml_rl import MamlRL, MetaBatch
from hogrod.rl.policies import (Categorical, CategoricalPolicy, DiagonalGaussian,
                                GaussianPolicy)
from hogrod.rl.returns import LinearFeatureBaseline, discounted_returns, gae_advantages
from hogrod.rl.rollout import Trajectories, policy_distribution, rollout
from hogrod.rl.trpo import LineSearch, NaturalStep, line_search, natural_step

__all__ = ["magic_box", "dice_surrogate", "discounted_returns", "gae_advantages",
           "LinearFeatureBaseline", "Categorical", "DiagonalGaussian", "CategoricalPolicy",
           "GaussianPolicy", "TabularMDP", "Navigation2D",
           "IteratedPrisonersDilemma", "expected_return", "make_lola_update",
           "LolaParams", "lola_dice_gradients", "joint_dice_surrogates", "sample_ipd",
           "ipd_log_probs", "ipd_values", "fit_ipd_values", "IPDTrajectories", "rollout",
           "Trajectories", "policy_distribution",
           "natural_step", "line_search", "NaturalStep", "LineSearch", "MamlRL", "MetaBatch",
           "inner_step", "gym_rollout", "HalfCheetahTasks", "HALFCHEETAH_TASKS",
           "TASK_SAMPLING"]
