"""Who runs next on a shared engine: the scheduler's plan and the engine queues that follow it."""
