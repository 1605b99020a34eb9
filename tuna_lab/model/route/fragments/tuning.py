"""Every tuning constant of the fragment programs, each with the reason for its value.

They trade time and memory against how often a search proves its bound;
none changes what a bound or a mapping means. The modules read them as
``tuning.NAME`` when they run, so that a test may set one for a case.
"""

__all__ = ["MAX_COLUMNS", "RESTRICTED_COLUMNS", "CUT_SIZES", "CUT_COLUMNS", "WORKER_PARTITIONS", "EXTRA_PARTS",
           "KEEP", "STATE_LIMIT", "TABLE_ROWS", "ALTERNATIVES", "WIDEN", "QUICK", "QUICK_S", "GROWTH",
           "FREE_COLUMNS", "JUMP_COLUMNS"]

# -- the program (program.py, build.py) ------------------------------------------------------------

#: Most columns (domain patterns plus worker partitions) :func:`~.build.fragment_program` writes out;
#: past it the program generates its columns (about what HiGHS's relaxation solves in a second).
MAX_COLUMNS = 60000

#: Most columns the integer program of :meth:`~.program.FragmentProgram.solve` keeps: HiGHS's
#: branch-and-bound time grows much faster than the columns past a few thousand.
RESTRICTED_COLUMNS = 8000

#: Most fragment sizes of a pattern (the largest) whose subsets :func:`~.program.worker_cuts` tries:
#: the subsets double with each size, and the rules a plan breaks involve its largest fragments.
CUT_SIZES = 8

#: Most columns of a restricted program that carries the worker rules: HiGHS stalls for many seconds
#: at the root of bigger ones on their 0-1 columns (past its time limit), and a program without them
#: still bounds every mapping (a plan that breaks them is not taken as one).
CUT_COLUMNS = 4000

#: Partitions of ``T`` above which the workers are generated too (:meth:`~.pricing.Pricing.price_workers`),
#: from those of at most ``EXTRA_PARTS`` more parts than the fewest: T = 32 into parts of 16 has 7,665
#: partitions, 36 has 15,892, and each is a column of every program solved.
WORKER_PARTITIONS = 10000
#: More parts than the fewest that the first generated partitions of ``T`` may have: enough for a
#: feasible start on the machines measured, and pricing adds what the optimum needs.
EXTRA_PARTS = 2

# -- pricing (pricing.py) ---------------------------------------------------------------------------

#: Most patterns of each shape one round of pricing adds: the best few are what the next relaxation
#: uses, and more would grow every later program for little.
KEEP = 200

#: Most partial patterns one level of :meth:`~.pricing.Pricing.price`'s walk may hold (a few hundred MB
#: at most): past it the walk gives up, and nothing is proven by that round.
STATE_LIMIT = 2_000_000

#: Most patterns :meth:`~.pricing.Pricing.table` writes out for pricing (the partitions of up to 32
#: threads are about 30,000; of 32 to 48, hundreds of thousands: those domains price with the pruned walk).
TABLE_ROWS = 100000

# -- price-and-branch (branching.py) ----------------------------------------------------------------

#: Most earlier plans a solution keeps as :attr:`~.program.FragmentSolution.alternatives`: each holds
#: its program alive, and a mapping rarely needs more than the second or third best.
ALTERNATIVES = 3

#: How much the branching's slack grows at most once it has a plan and its programs take time: the
#: columns within it (and HiGHS's time) grow much faster than the slack, and a better plan found on
#: the way lowers the slack the proof needs (``LP - plan``).
WIDEN = 1.5
#: A program that takes less than this share of the time left (and under ``QUICK_S``) is quick: the
#: slack then grows 4x, as its next program costs little more.
QUICK = 0.05
#: Seconds under which a program is quick (a few hundred columns), whatever the time left.
QUICK_S = 0.25

#: A widened restricted program holds at most ``GROWTH`` times the columns of the one before: HiGHS's
#: time grows faster than its columns.
GROWTH = 2.5
#: ... or this many, whichever is more (programs that small take HiGHS a fraction of a second).
FREE_COLUMNS = 1000

#: Most columns of the program that follows a quick one that found a plan (see
#: :meth:`~.branching.Branching.run`): about what HiGHS solves in a second or two.
JUMP_COLUMNS = 2500
