"""The optimizer side of a step: Adam on fp32 master weights, the precision policies, dynamic
loss scaling, global-norm clipping and the update that ties them together."""
