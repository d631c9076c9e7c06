"""zerospec.plan: will it fit, and what will it move? The closed-form planner and the DeepSpeed-config
reader with its measured check."""
