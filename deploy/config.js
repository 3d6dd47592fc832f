// The publisher's config.js in a container (deploy/Dockerfile, docker-compose.yml, and the
// ConfigMap of k8s/configmap.yaml, which holds the same text): every key is in docs/config.md.
// Several publishers share one bucket, so the Redis is external (no embedded Redis in a
// container). The image's command line sets the listen address: --host 0.0.0.0 --port 8080.
module.exports = {
    bucket: {
        redisUrl: "redis://redis:6379/0", // the `redis` service (compose) or Service (k8s)
        name: "changefeed",
        partitions: 1,
    },
    maxAge: 3600,
    // No authentication: the Triton listeners of this deployment send no token, and the
    // network policy / private network is what keeps strangers out. Replace it with auth.tokens
    // (and tls) as docs/security.md describes before exposing the port any further.
    auth: {mode: "none"},
    resources: [
        {resource: "vm", subResources: ["nic", "alias", "state"], bootstrapRoute: "/vms"},
        {resource: "network", subResources: ["ips", "name"], bootstrapRoute: "/networks"},
    ],
    limits: {
        // The balancers' idle timeouts (nginx.conf, haproxy.cfg: 90 s) must stay longer than
        // these two.
        pingInterval: 20,
        maxWait: 60,
    },
};
