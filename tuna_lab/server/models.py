"""Three XGBoost models shaped like the article's, trained on generated data and cached on disk.

The article serves models trained on three Kaggle data sets (Credit Card
Fraud, 29 features; Loan Defaulter, 155; MNIST, 784). None can be
downloaded here, so each model is trained on generated data of the same
shape with a fixed seed; see ``docs/server-models.md`` for how they differ.

XGBoost is imported inside functions only, and training runs in a child
interpreter: a Gunicorn master (or a notebook that launches one) must not
start GNU libgomp's thread pool before it forks, as the pool does not
survive ``fork``.

Examples
--------
>>> from tuna_lab.server.models import make_rows, load_booster
>>> make_rows("small", 100).shape
(100, 29)
>>> # Skipped as a doctest: loading trains the model on first use (seconds to minutes).
>>> booster = load_booster("small", nthread=2)   # doctest: +SKIP
"""

import fcntl
import hashlib
import os
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import astuple, dataclass
from pathlib import Path

import lazy_loader

from .. import _files
from .._checks import positive_int
from ..errors import ServerError

# The catalogue's names and costs are read by every `tuna-lab` start (the serve options' help);
# numpy only when data are made.
np = lazy_loader.load("numpy")

__all__ = ["STAGES", "MODEL_FEATURES", "model_trees", "model_cost", "cache_dir", "model_path", "ensure_model",
           "load_booster", "make_rows", "train_all", "import_xgboost", "check_model_cache"]

def import_xgboost():
    """The ``xgboost`` module, imported without scikit-learn when it is not loaded yet.

    Where scikit-learn is installed (the ``advise`` extra), ``import xgboost``
    imports it for its estimator wrappers, and with it scipy.stats, pandas and
    pyarrow: about a second of CPU and a hundred MB more in every server worker,
    for classes the server never uses (it predicts with a ``Booster``). So the
    import is made with scikit-learn hidden; the process can still import
    scikit-learn afterwards (only ``xgboost.XGBModel`` and friends then lack
    their scikit-learn base classes).

    Examples
    --------
    >>> import_xgboost().Booster.__name__      # doctest: +SKIP
    'Booster'
    """
    if "xgboost" not in sys.modules and "sklearn" not in sys.modules:
        sys.modules["sklearn"] = None           # `import sklearn` raises ImportError: xgboost goes without
        try:
            import xgboost
        finally:
            del sys.modules["sklearn"]
        return xgboost
    import xgboost

    return xgboost


#: Names of the five timed stages of a request, in pipeline order.
STAGES = ("deserialize", "convert", "dmatrix", "predict", "shap")

#: Feature count of each model, as in the article.
MODEL_FEATURES = {"small": 29, "medium": 155, "large": 784}

#: Bump when the data generators change in a way the recipes below do not show.
_GENERATOR_VERSION = 1


@dataclass(frozen=True)
class _Recipe:
    features: int
    rows: int
    objective: str
    num_class: int
    rounds: int
    max_depth: int
    eta: float
    seed: int


# Sizes grow small < medium < large (trees x leaves), while a request of
# 100 rows stays at tens of ms with one thread on a 2-core machine.
_RECIPES = {
    "small": _Recipe(29, 20_000, "binary:logistic", 1, 60, 4, 0.3, 20_241),
    "medium": _Recipe(155, 10_000, "binary:logistic", 1, 70, 5, 0.3, 20_242),
    "large": _Recipe(784, 4_000, "multi:softprob", 10, 12, 5, 0.3, 20_243),
}


def _recipe(name):
    try:
        return _RECIPES[name]
    except (KeyError, TypeError):
        raise ServerError(f"unknown model {name!r}; choose from {', '.join(MODEL_FEATURES)}") from None


def model_trees(name):
    """Number of trees of catalogue model ``name`` (one per class per boosting round).

    Known from the recipe, without training or loading the model.

    Examples
    --------
    >>> model_trees("large")
    120
    """
    recipe = _recipe(name)
    return recipe.rounds * recipe.num_class


def model_cost(name):
    """Work of one row of a request to catalogue model ``name``: trees x leaves per tree x depth, at most.

    SHAP is most of a request's time (12.6 of 13.8 s for 220,000 rows of
    ``small``), and TreeSHAP's work per row grows as trees x leaves x depth.
    The figure is the recipe's bound (``2 ** max_depth`` leaves per tree),
    known without training or loading the model; measured on one CPU, SHAP
    took 12-14 ns per unit on each of the three models (54, 135 and 227 us
    per row). The server refuses a
    request whose rows x cost exceed its work bound
    (:data:`tuna_lab.server.app.MAX_WORK`).

    Examples
    --------
    >>> [model_cost(name) for name in ("small", "medium", "large")]
    [3840, 11200, 19200]
    """
    recipe = _recipe(name)
    return model_trees(name) * 2 ** recipe.max_depth * recipe.max_depth


def cache_dir():
    """Directory of the cached models: ``$TUNA_LAB_CACHE`` or ``~/.cache/tuna_lab``.

    Examples
    --------
    >>> cache_dir() == Path(os.environ.get("TUNA_LAB_CACHE", "~/.cache/tuna_lab")).expanduser()
    True
    """
    env = os.environ.get("TUNA_LAB_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "tuna_lab"


def model_path(name):
    """Path of the cached model ``name``; its file name changes whenever the recipe does.

    Examples
    --------
    >>> model_path("small").name   # doctest: +ELLIPSIS
    'small-g1-seed20241-....ubj'
    """
    recipe = _recipe(name)
    digest = hashlib.sha1(repr((_GENERATOR_VERSION, name, astuple(recipe))).encode()).hexdigest()[:8]
    return cache_dir() / f"{name}-g{_GENERATOR_VERSION}-seed{recipe.seed}-{digest}.ubj"


def ensure_model(name, nthread=None):
    """Return the path of model ``name``, training it first if it is not cached.

    Training says so in one line on stderr, and how long it took in another.
    It runs in a child interpreter (so this process never starts
    OpenMP) under a file lock (so racing processes train once), and the
    file appears atomically.

    Parameters
    ----------
    name : {"small", "medium", "large"}
    nthread : int, optional
        Training threads; default all CPUs this process may use.

    Examples
    --------
    >>> # Skipped as a doctest: a first call trains the model (seconds).
    >>> ensure_model("small").exists()   # doctest: +SKIP
    True
    """
    path = model_path(name)
    # Loading as well as training: a model in a folder another user owns or may write (or reached through
    # their link) is theirs to choose, and a server - root's too - would serve it.
    _files.safe_dir(path.parent, _CACHE, ServerError)
    if _cached(path):
        return path
    if nthread is None:
        nthread = len(os.sched_getaffinity(0))
    nthread = positive_int("nthread", nthread, ServerError)
    lock_path = path.with_suffix(".lock")
    try:
        # Never through a link, never truncating a file that is there; O_NONBLOCK: a FIFO opens at once.
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise ServerError(f"cannot use model cache {str(path.parent)!r}: {exc.strerror}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise ServerError(f"the model cache's lock {str(lock_path)!r} is {_files.file_kind(mode)}, not a regular "
                          "file; remove it")
    lock = os.fdopen(fd, "r+")
    # A first `tuna-lab run` would otherwise sit silent for seconds to minutes: say what
    # happens and that it happens once (stderr: stdout carries a command's results).
    home, shown = str(Path.home()), str(path.parent)
    shown = "~" + shown[len(home):] if shown.startswith(home + os.sep) else shown
    print(f"training the {name} model once (cached in {shown}) ...", file=sys.stderr, flush=True)
    t0 = time.monotonic()
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _cached(path):   # another process may have trained it while we waited
            _train_in_child(name, path, nthread)
    print(f"trained the {name} model in {time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)
    return path


#: What the model cache is called in a refusal: the variable that names another one.
_CACHE = "model cache ($TUNA_LAB_CACHE)"


def _cached(path):
    """Whether the model file ``path`` is there; :class:`ServerError` (one line) if it is not one we made.

    A FIFO would block the worker that loads it, a link or another user's
    file would be a model someone else chose: each refused at once.
    """
    _, st = _files.check_path(path, _CACHE, ServerError, link=False)
    if st is None:
        return False
    if not stat.S_ISREG(st.st_mode):
        raise ServerError(f"cached model {str(path)!r} is {_files.file_kind(st.st_mode)}, not a regular file; "
                          "remove it")
    if st.st_uid not in {0, os.geteuid()}:
        raise ServerError(f"cached model {str(path)!r} belongs to another user (uid {st.st_uid}); remove it")
    return True


def check_model_cache(name):
    """Refuse (:class:`ServerError`, one line) a model cache that :func:`ensure_model` would refuse; make nothing.

    For a command to say so before it measures anything: its folder's whole
    path, and the cached model ``name`` if there.

    Examples
    --------
    >>> check_model_cache("small")
    """
    path = model_path(name)
    _, st = _files.check_path(path.parent, _CACHE, ServerError)
    if st is not None:
        _cached(path)


def train_all(nthread=None):
    """Train (or find) every model; returns ``{name: path}``.

    Examples
    --------
    >>> # Skipped as a doctest: it trains every model (minutes).
    >>> sorted(train_all())   # doctest: +SKIP
    ['large', 'medium', 'small']
    """
    return {name: ensure_model(name, nthread) for name in MODEL_FEATURES}


def load_booster(name, nthread):
    """Load model ``name`` (training it if needed) to run ``nthread`` OpenMP threads.

    XGBoost still runs no more threads than the CPUs OpenMP sees; see
    ``docs/server-models.md``.

    Examples
    --------
    >>> # Skipped as a doctest: a first call trains the model (seconds to a minute).
    >>> load_booster("medium", nthread=4).num_features()   # doctest: +SKIP
    155
    """
    nthread = positive_int("nthread", nthread, ServerError)
    path = ensure_model(name)
    xgboost = import_xgboost()         # first: ThreadpoolController sees the OpenMP it loads
    from threadpoolctl import ThreadpoolController

    # XGBoost runs min(nthread, omp_get_max_threads(), CPUs) threads, and
    # loading a model runs one parallel region at OpenMP's default size. So:
    # exactly nthread while loading (the pool it creates is the pool we
    # want), then at least nthread (never lowered: other boosters may live here).
    omp = ThreadpoolController().select(user_api="openmp")
    default = max((lib["num_threads"] for lib in omp.info()), default=nthread)
    omp.limit(limits=nthread)
    # Read by the one file layer (no link, no FIFO, a size cap), then parsed from memory: XGBoost would
    # open the name again, and block on whatever is there by then.
    data = bytearray(_files.read_bytes(path, follow=False, error=ServerError))
    try:
        booster = xgboost.Booster(params={"nthread": nthread}, model_file=data)
    except xgboost.core.XGBoostError as exc:
        first = (str(exc).strip().splitlines() or ["unknown error"])[0]
        raise ServerError(f"cannot load model {name!r} from {str(path)!r}: {first}") from None
    finally:
        omp.limit(limits=max(default, nthread))
    # Explicit, so neither OMP_NUM_THREADS nor XGBoost's all-cores default decides.
    booster.set_param({"nthread": nthread})
    return booster


def make_rows(name, batch, seed=0):
    """A request payload: ``batch`` records of model ``name``, drawn like its training data.

    Examples
    --------
    >>> make_rows("large", 3, seed=1).shape
    (3, 784)
    """
    recipe = _recipe(name)
    batch = positive_int("batch", batch, ServerError)
    # A different stream from the training rows (stream 0), so payloads are unseen data.
    rng = np.random.default_rng([recipe.seed, 1, seed])
    X, _ = _GENERATORS[name](batch, rng, recipe.seed)
    return X


# -- data --------------------------------------------------------------------------------
# Each generator draws rows from ``rng``; the hidden "world" (weights, digit
# templates) comes from ``world_seed`` only, so training rows and payload
# rows follow the same distribution. Labels cut a nonlinear score at a
# quantile of the sample: only training uses them, so that is stable enough.

def _card_fraud(n, rng, world_seed):
    """28 PCA-like components of decreasing spread plus a log-normal amount; ~5 % positives."""
    world = np.random.default_rng(world_seed)
    scale = np.linspace(2.0, 0.3, 28)
    V = rng.standard_normal((n, 28)) * scale
    amount = rng.lognormal(3.5, 1.2, n)
    w = world.standard_normal(28) / np.sqrt(28)
    z = (1.5 * np.sin(V[:, 0]) - V[:, 1] * V[:, 2] + np.maximum(V[:, 3] - 1.0, 0.0) * 2.0
         + 0.4 * np.log1p(amount) * (V[:, 4] > 0) + V @ w + 0.5 * rng.standard_normal(n))
    X = np.column_stack([V, np.round(amount, 2)])
    return X.astype(np.float32), (z > np.quantile(z, 0.95)).astype(np.float32)


def _loan_default(n, rng, world_seed):
    """60 numeric, 40 log-normal amounts, 40 integer codes, 15 flags; ~10 % defaults."""
    world = np.random.default_rng(world_seed)
    num = rng.standard_normal((n, 60))
    amounts = rng.lognormal(world.uniform(6, 11, 40), 0.8, (n, 40))
    levels = world.integers(3, 20, 40)
    codes = np.floor(rng.random((n, 40)) * levels)
    flags = rng.random((n, 15)) < world.uniform(0.05, 0.5, 15)
    la = np.log(amounts)
    w = world.standard_normal(60) * (world.random(60) < 0.3)
    z = (num @ w / 3 + np.tanh(la[:, 0] - la[:, 1]) + 0.8 * (codes[:, 0] % 3 == 1)
         - 0.6 * flags[:, 0] * num[:, 1] + 0.5 * np.sin(codes[:, 2]) * flags[:, 3]
         + 0.3 * np.abs(num[:, 5] * num[:, 6]) + 0.7 * rng.standard_normal(n))
    X = np.column_stack([num, np.round(amounts, 2), codes, flags])
    return X.astype(np.float32), (z > np.quantile(z, 0.90)).astype(np.float32)


def _digits(n, rng, world_seed):
    """28x28 "digits": a shifted stroke template per class, blended with a second class.

    Pixels are integers 0..255 with a zero background, like MNIST; the
    blend with another class makes the classes overlap, so trees grow.
    """
    templates = _digit_templates(world_seed)                     # (10, 28, 28)
    label = rng.integers(0, 10, n)
    other = (label + rng.integers(1, 10, n)) % 10
    mix = rng.uniform(0.0, 0.7, n)[:, None, None]
    img = templates[label] * (1 - 0.5 * mix) + templates[other] * mix
    # Shift each image by up to 2 pixels: group by shift so np.roll runs 25 times, not n.
    shift = rng.integers(-2, 3, (n, 2))
    for dy in range(-2, 3):
        for dx in range(-2, 3):
            sel = (shift[:, 0] == dy) & (shift[:, 1] == dx)
            img[sel] = np.roll(img[sel], (dy, dx), axis=(1, 2))
    img = img * rng.uniform(0.7, 1.0, (n, 1, 1)) + rng.normal(0, 25, img.shape)
    img = np.clip(np.round(img), 0, 255)
    img[img < 40] = 0
    return img.reshape(n, 784).astype(np.float32), label.astype(np.float32)


def _digit_templates(world_seed):
    world = np.random.default_rng(world_seed)
    yy, xx = np.mgrid[0:28, 0:28].astype(float)
    out = np.zeros((10, 28, 28))
    for k in range(10):
        for _ in range(3):
            (y0, x0), (y1, x1) = world.uniform(5, 23, (2, 2))
            d = _segment_distance(yy, xx, y0, x0, y1, x1)
            out[k] = np.maximum(out[k], 255 * np.exp(-(d / 1.5) ** 2))
    return out


def _segment_distance(yy, xx, y0, x0, y1, x1):
    dy, dx = y1 - y0, x1 - x0
    t = np.clip(((yy - y0) * dy + (xx - x0) * dx) / max(dy * dy + dx * dx, 1e-9), 0, 1)
    return np.hypot(yy - (y0 + t * dy), xx - (x0 + t * dx))


_GENERATORS = {"small": _card_fraud, "medium": _loan_default, "large": _digits}


# -- training ----------------------------------------------------------------------------

def _train_in_child(name, path, nthread):
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    # Spinning OpenMP waiters make training 10x slower when another process
    # holds a core (measured on a busy 2-core machine); sleeping ones do not.
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    env["OMP_NUM_THREADS"] = str(nthread)   # XGBoost never runs more than OpenMP's maximum
    code = ("import sys; from tuna_lab.server.models import _train; "
            "_train(sys.argv[1], sys.argv[2], int(sys.argv[3]))")
    proc = subprocess.run([sys.executable, "-c", code, name, str(path), str(nthread)],
                          env=env, capture_output=True, text=True)
    if proc.returncode != 0 or not path.exists():
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise ServerError(f"training model {name!r} failed: {tail}")


def _train(name, path, nthread):
    """Train model ``name`` in this process and write it atomically to ``path``; returns seconds."""
    xgboost = import_xgboost()

    recipe = _recipe(name)
    t0 = time.perf_counter()
    X, y = _GENERATORS[name](recipe.rows, np.random.default_rng([recipe.seed, 0]), recipe.seed)
    params = {"objective": recipe.objective, "max_depth": recipe.max_depth, "eta": recipe.eta,
              "tree_method": "hist", "subsample": 0.8, "seed": recipe.seed, "nthread": nthread}
    if recipe.num_class > 1:
        params["num_class"] = recipe.num_class
    booster = xgboost.train(params, xgboost.DMatrix(X, label=y, nthread=nthread), recipe.rounds)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Write beside the target, then rename: a reader sees no file or a whole one.
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".ubj", dir=path.parent)
    os.close(fd)
    try:
        booster.save_model(tmp)
        os.chmod(tmp, 0o644)   # mkstemp's 0600 would hide a shared cache from other users
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return time.perf_counter() - t0
