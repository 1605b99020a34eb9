"""The advisor's regressors of ``log(speedup)``: a small XGBoost model, a ridge baseline and a constant one.

All learn the log of the speedup: a ratio's log is symmetric (1.25x faster
and 1.25x slower are +-0.22), so neither direction dominates the squared
error. The advisor reports predictions back as speedups. All follow the
scikit-learn estimator protocol (``fit(X, y)`` returns the estimator,
``predict(X)``), so the cross-validation treats them alike. The constant
baseline (the training rows' mean ``log(speedup)``, i.e. their geometric-mean
speedup, whatever the features) is the yardstick: a regressor that does no
better on held-out configurations has learnt nothing from the features.

Examples
--------
>>> import numpy as np
>>> X = np.c_[np.arange(8.0), np.r_[np.nan, np.ones(7)]]
>>> y = 0.1 * X[:, 0]
>>> {name: round(float(reg.fit(X, y).predict(X[:1])[0]), 2) for name, reg in regressors().items()}
{'xgboost': 0.0, 'linear': 0.0, 'constant': 0.35}
"""

import numpy as np

from ...errors import AdviseError

__all__ = ["BoostedTrees", "ConstantBaseline", "linear_baseline", "regressors", "require_sklearn", "RIDGE_ALPHAS"]

#: The ridge penalties the linear baseline chooses from.
RIDGE_ALPHAS = 10.0 ** np.arange(-3, 4.5, 0.5)

# A small booster for a small table (tens of configurations x a few policies):
# shallow trees, a slow learning rate, one thread (the machine is shared).
_XGB_PARAMS = {"objective": "reg:squarederror", "max_depth": 3, "eta": 0.15, "min_child_weight": 1.0,
               "subsample": 1.0, "lambda": 1.0, "tree_method": "exact", "seed": 0}
_XGB_ROUNDS = 100


class BoostedTrees:
    """A small XGBoost regressor (native API); missing values are handled natively.

    Parameters
    ----------
    nthread : int
        XGBoost threads (the data are small: one is enough).
    seed : int

    Attributes
    ----------
    booster : xgboost.Booster
        After :meth:`fit`; its features are named ``f0, f1, ...`` by column.

    Examples
    --------
    >>> import numpy as np
    >>> X, y = np.arange(10.0)[:, None], np.r_[np.zeros(5), np.ones(5)]
    >>> BoostedTrees().fit(X, y).predict(np.array([[0.0], [9.0]])).round(1).tolist()
    [0.0, 1.0]
    """

    def __init__(self, nthread=1, seed=0):
        self.nthread, self.seed = nthread, seed

    def fit(self, X, y):
        """Train on ``X`` (rows x features, NaN: missing) and ``y``; returns ``self``."""
        import xgboost

        params = dict(_XGB_PARAMS, nthread=self.nthread, seed=self.seed)
        dtrain = xgboost.DMatrix(np.asarray(X, float), label=np.asarray(y, float), nthread=self.nthread)
        self.booster = xgboost.train(params, dtrain, num_boost_round=_XGB_ROUNDS)
        return self

    def predict(self, X):
        """Predictions for the rows of ``X``."""
        import xgboost

        return self.booster.predict(xgboost.DMatrix(np.asarray(X, float), nthread=self.nthread))


class ConstantBaseline:
    """Predicts the training rows' mean target for every row, whatever its features.

    Fitted on ``log(speedup)``, it predicts the training rows' geometric-mean
    speedup: the yardstick of the advisor's evaluation.

    Examples
    --------
    >>> import numpy as np
    >>> ConstantBaseline().fit(np.zeros((3, 1)), np.log([1.0, 2.0, 4.0])).predict(np.ones((2, 1))).round(3).tolist()
    [0.693, 0.693]
    """

    def fit(self, X, y):
        """Remember the mean of ``y`` (``X`` is ignored); returns ``self``."""
        self.value = float(np.mean(np.asarray(y, float)))
        return self

    def predict(self, X):
        """The training mean, once per row of ``X``."""
        return np.full(len(X), self.value)


def require_sklearn():
    """Check that scikit-learn is installed, else say in one line how to install it.

    The slim install (``make demo``, ``pip install tuna_lab``) leaves it out;
    the ``advise`` extra (and ``dev``, ``lab``) brings it.

    Raises
    ------
    AdviseError
        If scikit-learn cannot be imported.

    Examples
    --------
    >>> require_sklearn()
    """
    try:
        import sklearn  # noqa: F401
    except ImportError:
        raise AdviseError("the advisor needs scikit-learn, which the slim install leaves out: "
                          "pip install 'tuna_lab[advise]'") from None


def linear_baseline():
    """Ridge regression on standardised features, its penalty chosen by leave-one-out cross-validation.

    A small sweep has about as many features as configurations: plain least
    squares then interpolates its training rows and extrapolates without
    bound (held-out predictions of exp(700)x), which would make a straw man
    of the baseline. Two guards keep it a fair one: a ridge penalty
    ``alpha * |coef|^2`` (intercept not penalised), ``alpha`` picked from
    :data:`RIDGE_ALPHAS` by (efficient) leave-one-out cross-validation on the
    training rows only; and each feature held to its training range when
    predicting, as the trees are by construction (a column that only varied
    by noise in training, such as a stage time, would otherwise turn a
    held-out configuration 50 standard deviations away into any speedup at
    all). Missing values are filled with the training median (0 for a column
    missing in every training row).

    Returns
    -------
    sklearn.pipeline.Pipeline
        Unfitted: median imputation, clipping to the training range
        (``MinMaxScaler(clip=True)``, an affine map the standardisation
        after it undoes), standardisation, ``RidgeCV``.

    Examples
    --------
    >>> [name for name, _ in linear_baseline().steps]
    ['simpleimputer', 'minmaxscaler', 'standardscaler', 'ridgecv']

    Raises
    ------
    AdviseError
        If scikit-learn is not installed (:func:`require_sklearn`).
    """
    require_sklearn()
    from sklearn.impute import SimpleImputer
    from sklearn.linear_model import RidgeCV
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import MinMaxScaler, StandardScaler

    return make_pipeline(SimpleImputer(strategy="median", keep_empty_features=True), MinMaxScaler(clip=True),
                         StandardScaler(), RidgeCV(alphas=RIDGE_ALPHAS))


def regressors(nthread=1, seed=0):
    """Fresh, unfitted regressors by name: ``xgboost`` (the advisor's), ``linear`` and ``constant`` (the baselines).

    Examples
    --------
    >>> list(regressors())
    ['xgboost', 'linear', 'constant']
    """
    return {"xgboost": BoostedTrees(nthread, seed), "linear": linear_baseline(), "constant": ConstantBaseline()}
