"""Preparing and unpreparing claims for the kubelet (NodePrepareResources/NodeUnprepareResources).

``preparer`` is the flow (answer what is prepared → read and plan → write CDI specs and one
checkpoint under the node lock); ``decide`` holds its pure decisions; ``budget`` the time budget,
the typed failure (permanent vs retryable) and the bounded claim read; ``nodestate`` the
checkpoint and CDI directory shared by the plugin instances of a node; ``unprepare`` the
reverse, from local state only.
"""
