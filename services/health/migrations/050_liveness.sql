-- Which figures may set a group's bar: those of a node alive now, checked recently, under the same suite version
-- (domain/liveness.py). The suite version is kept with each result and with the node's figures.
ALTER TABLE check_results ADD COLUMN suite_version text;
ALTER TABLE nodes ADD COLUMN figures_suite text;  -- the suite version of ``figures`` (NULL: before versions)
