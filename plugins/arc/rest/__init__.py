"""The `arc` backend's REST interface to A-REX: the calls (:mod:`.client`), the delegation's
signing (:mod:`.signing`) and life (:mod:`.delegation`), job descriptions and answers
(:mod:`.jobs`), and the backend's REST path (:mod:`.interface`)."""
