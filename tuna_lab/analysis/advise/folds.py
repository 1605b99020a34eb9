"""Grouped cross-validation folds: a configuration is never split between training and test.

Every fold leaves whole configurations out (all their policies), so nothing
measured in a held-out configuration is seen in training. With few
configurations each is left out once; with more, they are dealt into 10
folds.

Examples
--------
>>> [test.tolist() for _, test in grouped_folds(["w1", "w1", "w2", "w4"])]
[[0, 1], [2], [3]]
"""

import numpy as np
import pandas as pd

from ...errors import AdviseError
from .regressors import require_sklearn

__all__ = ["grouped_folds", "LEAVE_ONE_OUT_UP_TO", "DEFAULT_FOLDS"]

#: Up to this many configurations, each is held out once; above, grouped K-fold.
LEAVE_ONE_OUT_UP_TO = 12
#: Folds of the grouped K-fold above :data:`LEAVE_ONE_OUT_UP_TO` configurations.
DEFAULT_FOLDS = 10


def grouped_folds(groups, n_splits=None, seed=0):
    """Train/test index pairs that never split a group (a configuration) between the two.

    Parameters
    ----------
    groups : array-like
        One label per row; rows with equal labels always land on the same side.
    n_splits : int, optional
        Number of folds. Default: one fold per group (leave one group out) up
        to 12 groups, else 10 folds of whole groups.
    seed : int
        Shuffles the groups before they are dealt into folds (with fewer
        folds than groups; one fold per group holds them out in sorted order).

    Returns
    -------
    list of (numpy.ndarray, numpy.ndarray)
        Row indices ``(train, test)``; every row is in exactly one ``test``.
        The folds' numbers of groups differ by at most one.

    Raises
    ------
    AdviseError
        If there are fewer than two groups or ``n_splits`` is not in ``2..n_groups``, or
        scikit-learn is not installed.

    Examples
    --------
    >>> folds = grouped_folds(["a", "a", "b", "c"])
    >>> [test.tolist() for _, test in folds]
    [[0, 1], [2], [3]]
    """
    require_sklearn()
    from sklearn.model_selection import GroupKFold, LeaveOneGroupOut

    codes, uniques = pd.factorize(pd.Series(list(groups), dtype=object), sort=True)
    k = len(uniques)
    if k < 2:
        raise AdviseError(f"cross-validation needs at least 2 configurations, got {k}")
    if n_splits is None:
        n_splits = k if k <= LEAVE_ONE_OUT_UP_TO else DEFAULT_FOLDS
    if isinstance(n_splits, bool) or not isinstance(n_splits, (int, np.integer)) or not 2 <= n_splits <= k:
        raise AdviseError(f"n_splits must be an integer from 2 to the number of configurations ({k}), "
                          f"got {n_splits!r}")
    splitter = (LeaveOneGroupOut() if n_splits == k else
                GroupKFold(n_splits=int(n_splits), shuffle=True, random_state=seed))
    return list(splitter.split(codes, groups=codes))
