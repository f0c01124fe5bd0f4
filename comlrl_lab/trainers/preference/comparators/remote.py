"""The ``api`` comparator: completions from a remote endpoint, turned into comparator-side joint candidates.

The HTTP work (formats, retries, concurrency, keys) lives in ``api.py``; this module only maps requests to
items and agents, and texts back to candidates tokenised with each agent's tokenizer.
"""

from __future__ import annotations

from collections.abc import Sequence

from comlrl_lab.data.records import JointCandidate
from comlrl_lab.trainers.preference.comparators.api import ApiComparatorClient, ApiRequest
from comlrl_lab.trainers.preference.comparators.base import Comparator


class RemoteApiComparator(Comparator):
    local = False

    def __init__(self, context):
        super().__init__(context)
        # The client resolves the key now, so a missing key fails before any request, naming the variable.
        self.client = ApiComparatorClient(context.config, rng=context.streams.python("comparator_api"))

    def generate(
        self, items: Sequence[dict], item_indices: Sequence[int], prompts: list[list[str]], num_candidates: int
    ):
        if self.centralized:
            return self._generate_centralized(items, item_indices, prompts, num_candidates)
        # The endpoint gets the task's own prompt (its chat format is its own); the candidates keep the agents'.
        sent = self.context.request_formatters
        requests = [
            ApiRequest(
                prompt=sent[i](items[k]) if sent else prompts[i][k],
                agent_idx=i,
                batch_item=dict(items[k]),
                num_candidates=num_candidates,
            )
            for k in range(len(items))
            for i in range(self.num_agents)
        ]
        answers = self.client.complete_many(requests)
        joint: list[list[JointCandidate]] = []
        for k, item_index in enumerate(item_indices):
            per_agent = [answers[k * self.num_agents + i] for i in range(self.num_agents)]
            count = min(len(texts) for texts in per_agent)
            agent_prompts = [prompts[i][k] for i in range(self.num_agents)]
            joint.append(
                [
                    self.text_candidate(item_index, j, agent_prompts, [per_agent[i][j] for i in range(self.num_agents)])
                    for j in range(count)
                ]
            )
        return joint

    def centralized_texts(
        self, central_prompts: list[str], items: Sequence[dict], num_candidates: int
    ) -> list[list[str]]:
        requests = [
            ApiRequest(
                prompt=prompt, agent_idx=self.central_index, batch_item=dict(item), num_candidates=num_candidates
            )
            for prompt, item in zip(central_prompts, items)
        ]
        return self.client.complete_many(requests)
