"""rankd as a cluster on PostgreSQL (see docs/cluster.md).

Postgres is the commit point and the fencing authority: every board group's
log lives there, and an append commits only if the appender still holds the
group's current epoch (:mod:`rankd.cluster.log`).  Nothing here is a
consensus protocol of rankd's own: leases only say who *should* write; the
compare-and-set in Postgres says who *may*.
"""
