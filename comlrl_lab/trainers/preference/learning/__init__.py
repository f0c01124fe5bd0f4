"""The learning maths: losses, the DPO and policy learners' optimisers, the reward model, policy learning."""
