"""zerospec: an executable specification of ZeRO (Rajbhandari et al., arXiv:1910.02054)."""
from .cluster import RankContext, VirtualCluster
from .errors import ClusterAborted, ClusterError, CollectiveError, CollectiveTimeout, RankError

__version__ = "0.1.0"
__all__ = ["VirtualCluster", "RankContext", "ClusterError", "ClusterAborted", "CollectiveError",
           "CollectiveTimeout", "RankError"]
