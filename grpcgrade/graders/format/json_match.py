"""Deep comparison of a JSON response with a JSON reference (OpenJudge `JsonMatchGrader`, decision D1)."""

from __future__ import annotations

import json
from collections import Counter, deque
from collections.abc import Hashable, Iterable
from typing import Any

from grpcgrade.grader import BaseGrader, GraderScore

# What the reference catches around `json.loads` (anything else it raises: an error result, D7).
_MALFORMED = (json.JSONDecodeError, TypeError)

# Unordered lists of objects compared with `ignore_extra_keys` need pairwise checks (the relation is not an
# equality, so items cannot all be hashed into buckets). Past this many checks beyond the linear minimum
# in one sample the grader gives up with an error instead of tying up a worker for hours on a hostile list.
PAIR_CHECK_BUDGET = 300_000


class JsonMatchGrader(BaseGrader):
    """Scores 1.0 when the response's JSON matches the reference's JSON, 0.0 otherwise.

    Decision D1 (JSON semantics instead of the reference's Python `==`): booleans never equal numbers,
    numbers compare by value (`1` matches `1.0`), NaN matches nothing, a missing key does not match an
    explicit `null`, and with `strict_order=False` two lists match when every response item can be paired
    with a distinct reference item (a real bipartite matching, where the reference's greedy first fit
    gives false negatives). With `ignore_extra_keys=True` only the reference's keys of each object are
    compared, so the response may carry more.

    A response or reference that `json.loads` rejects as malformed (JSONDecodeError, or a non-string:
    TypeError) scores 0.0 with `error` = `response_parse_error` / `reference_parse_error`, as the reference
    does. Any other refusal (nesting past the recursion limit: RecursionError; an integer over CPython's
    4,300 digits: ValueError) makes the reference raise, so here it is an error result (D7), not a score.
    """

    #: Compares the response with the reference: a sample without either is INVALID_SAMPLE, not a match of
    #: two empty texts.
    required_inputs = frozenset(("response", "reference_response"))

    def __init__(self, strict_order: bool = True, ignore_extra_keys: bool = False) -> None:
        super().__init__()
        self.strict_order = bool(strict_order)
        self.ignore_extra_keys = bool(ignore_extra_keys)

    def evaluate(self, reference_response: str = "", response: str = "", **kwargs: Any) -> GraderScore:
        try:
            response_json = json.loads(response)
        except _MALFORMED as e:
            return self._parse_error("response_parse_error", e)
        try:
            reference_json = json.loads(reference_response)
        except _MALFORMED as e:
            return self._parse_error("reference_parse_error", e)

        try:
            matcher = _Matcher(self.strict_order, self.ignore_extra_keys)
            matched = matcher.matches(response_json, reference_json)
        except RecursionError as e:
            raise ValueError("JSON nested too deeply to compare") from e
        return GraderScore(
            name=self.name,
            score=1.0 if matched else 0.0,
            reason=f"JSON match: {'matched' if matched else 'not matched'}",
            metadata={
                "matched": matched,
                "strict_order": self.strict_order,
                "ignore_extra_keys": self.ignore_extra_keys,
            },
        )

    def _parse_error(self, error: str, exc: Exception) -> GraderScore:
        return GraderScore(
            name=self.name,
            score=0.0,
            reason=str(exc),
            metadata={"matched": False, "error": error, "error_message": str(exc)},
        )


# Canonical forms of JSON values: strings, numbers and null stand for themselves (Python compares and
# hashes numbers exactly and by value, and never equates them with strings or None); booleans, NaN and
# containers get forms no number can equal.
_TRUE, _FALSE, _OBJECT, _ARRAY = object(), object(), object(), object()


class _Matcher:
    """One comparison. Canonical forms make everything but the `ignore_extra_keys` object case a hash
    comparison, so large inputs cost linear time rather than the reference's quadratic scans."""

    def __init__(self, strict_order: bool, ignore_extra_keys: bool) -> None:
        self.strict_order = strict_order
        self.ignore_extra_keys = ignore_extra_keys
        # Containers by id (they stay alive for the whole comparison), so each is worked out once.
        self._forms: dict[int, Hashable] = {}
        self._object_bearing: dict[int, bool] = {}
        self._pair_checks = 0

    def canon(self, value: Any) -> Hashable:
        """A hashable form, equal for two values exactly when they match with no extra keys allowed."""
        if isinstance(value, str) or value is None:
            return value
        if isinstance(value, bool):
            return _TRUE if value else _FALSE
        if isinstance(value, (int, float)):
            return value if value == value else object()  # NaN equals nothing, itself included
        form = self._forms.get(id(value))
        if form is None:
            if isinstance(value, dict):
                form = (_OBJECT, frozenset(zip(value, map(self.canon, value.values()), strict=True)))
            else:
                forms = list(map(self.canon, value))
                form = (_ARRAY, tuple(forms) if self.strict_order else frozenset(Counter(forms).items()))
            self._forms[id(value)] = form
        return form

    def has_object(self, value: Any) -> bool:
        """Whether an object occurs in the value: only objects make `ignore_extra_keys` matter."""
        if isinstance(value, dict):
            return True
        if not isinstance(value, list):
            return False
        found = self._object_bearing.get(id(value))
        if found is None:
            found = self._object_bearing[id(value)] = any(map(self.has_object, value))
        return found

    def matches(self, response: Any, reference: Any) -> bool:
        # Without objects on both sides, "matches" is an equality; an object facing a non-object never
        # matches, and the canonical forms differ there too.
        if not (self.ignore_extra_keys and self.has_object(response) and self.has_object(reference)):
            return self.canon(response) == self.canon(reference)
        if isinstance(response, dict) and isinstance(reference, dict):
            return all(key in response and self.matches(response[key], value) for key, value in reference.items())
        if isinstance(response, list) and isinstance(reference, list) and len(response) == len(reference):
            if self.strict_order:
                return all(self.matches(r, c) for r, c in zip(response, reference, strict=True))
            return self._pairable(response, reference)
        return False

    def _pairable(self, response: list[Any], reference: list[Any]) -> bool:
        """Whether each response item pairs with a distinct reference item (equal lengths given)."""
        # Object-free items only match equal object-free items: compare those as multisets.
        plain_response = Counter(self.canon(item) for item in response if not self.has_object(item))
        plain_reference = Counter(self.canon(item) for item in reference if not self.has_object(item))
        if plain_response != plain_reference:
            return False
        response_groups = self._object_groups(response)
        reference_groups = self._object_groups(reference)
        # An object-free field of a reference object must appear, equal, in any response object that
        # matches it: indexing those fields narrows the pairwise checks to plausible pairs.
        index: dict[tuple[str, Hashable], set[int]] = {}
        for i, (item, _) in enumerate(response_groups):
            for plain_field in self._plain_fields(item):
                index.setdefault(plain_field, set()).add(i)
        adjacency: list[list[int]] = [[] for _ in response_groups]
        for j, (reference_item, _) in enumerate(reference_groups):
            postings = sorted((index.get(f, set()) for f in self._plain_fields(reference_item)), key=len)
            candidates = postings[0].intersection(*postings[1:]) if postings else range(len(response_groups))
            self._spend(max(len(candidates) - 1, 0))  # one check per reference item is linear work: free
            for i in candidates:
                if self.matches(response_groups[i][0], reference_item):
                    adjacency[i].append(j)
        return self._saturates(
            [count for _, count in response_groups], [count for _, count in reference_groups], adjacency
        )

    def _plain_fields(self, item: Any) -> list[tuple[str, Hashable]]:
        if not isinstance(item, dict):
            return []
        return [(key, self.canon(value)) for key, value in item.items() if not self.has_object(value)]

    def _object_groups(self, items: Iterable[Any]) -> list[tuple[Any, int]]:
        """Object-bearing items grouped by canonical form (one representative and a count): equal items
        match the same partners, so the pairing works on groups rather than on every item."""
        groups: dict[Hashable, list[Any]] = {}
        for item in items:
            if self.has_object(item):
                groups.setdefault(self.canon(item), [item, 0])[1] += 1
        return [(item, count) for item, count in groups.values()]

    def _saturates(self, supply: list[int], demand: list[int], adjacency: list[list[int]]) -> bool:
        """Bipartite b-matching by augmenting paths: can every copy of every response group i be paired
        with a copy of some reference group in adjacency[i], no reference copy used twice?"""
        spare = list(demand)
        # assigned[j][i]: copies of response group i currently paired with reference group j.
        assigned: list[dict[int, int]] = [{} for _ in demand]
        for source, need in enumerate(supply):
            while need:
                reached_from: dict[int, int] = {}  # reference group -> response group that reached it
                reached_via: dict[int, int] = {}  # response group -> reference group it was taken back from
                queue = deque([source])
                end = None
                while queue and end is None:
                    group = queue.popleft()
                    if group != source:  # the first hop is bounded by the edges: free
                        self._spend(len(adjacency[group]))
                    for j in adjacency[group]:
                        if j in reached_from:
                            continue
                        reached_from[j] = group
                        if spare[j]:
                            end = j
                            break
                        for other in assigned[j]:
                            if other != source and other not in reached_via:
                                reached_via[other] = j
                                queue.append(other)
                if end is None:
                    return False
                amount = min(need, spare[end])
                j = end
                while (group := reached_from[j]) != source:
                    j = reached_via[group]
                    amount = min(amount, assigned[j][group])
                spare[end] -= amount
                need -= amount
                j = end
                while True:
                    group = reached_from[j]
                    assigned[j][group] = assigned[j].get(group, 0) + amount
                    if group == source:
                        break
                    j = reached_via[group]
                    assigned[j][group] -= amount
                    if not assigned[j][group]:
                        del assigned[j][group]
        return True

    def _spend(self, checks: int) -> None:
        self._pair_checks += checks
        if self._pair_checks > PAIR_CHECK_BUDGET:
            raise ValueError(
                f"unordered list comparison needs more than {PAIR_CHECK_BUDGET:,} item checks; "
                "use strict_order=true or ignore_extra_keys=false for lists this large"
            )
