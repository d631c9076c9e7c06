"""Errors shared by the cluster, the interconnect and its backends."""


class ClusterError(RuntimeError):
    """Base of the errors a cluster raises."""


class RankError(ClusterError):
    """The first failure of a run, naming the rank and what it was doing."""

    def __init__(self, message: str, rank: int):
        super().__init__(message)
        self.rank = rank

    def __reduce__(self):   # pickled whole (a report helper's error reaches the report's process)
        return type(self), (str(self), self.rank), self.__dict__


class ClusterAborted(ClusterError):
    """Raised on a rank whose run was aborted because another rank failed."""


class CollectiveTimeout(ClusterError):
    """A collective waited longer than the timeout; names the ranks that never arrived."""


class CollectiveError(ClusterError):
    """Ranks disagree about a collective (op, shape, dtype) or its input is invalid."""
