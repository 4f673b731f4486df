"""The cluster: membership, liveness, links to the other members and what they measure."""
