"""Train on your own environment from Python: ``python examples/train_corridor.py``."""

import seedbed

# Actors are processes started afresh, which import this script again: the guard keeps them
# from training too (Python's multiprocessing "spawn" rule).
if __name__ == "__main__":
    # The best return is 0.94 (7 steps right); a random walk seldom reaches the end in 100 steps.
    summary = seedbed.train(env="corridor:Corridor-v0", target_return=0.9, total_frames=500_000)
    print(f"{summary['stop_reason']} after {summary['frames']} frames in {summary['run_dir']}")
    result = seedbed.evaluate(summary["run_dir"], episodes=5)
    print(f"evaluation: mean return {result['mean_return']:.2f} over 5 episodes")
