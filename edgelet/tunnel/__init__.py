"""konnectivity (apiserver-network-proxy): edgelet as the agent for its own kubelet API, for nodes the API server
cannot dial. `policy.py` holds the pure decisions, `agent.py` the streams and the spliced connections."""
