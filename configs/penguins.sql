-- A rows table as ML teams keep one: text labels, NULLs, and an array per row.
CREATE TABLE penguins (
    id int PRIMARY KEY,
    island text NOT NULL,     -- a category
    sex text,                 -- a category, NULL where unknown
    bill_mm real,             -- NULL where not measured
    flipper_mm int NOT NULL,
    measures real[] NOT NULL  -- three numbers per penguin
);
INSERT INTO penguins
SELECT i,
       (ARRAY['Biscoe', 'Dream', 'Torgersen'])[1 + i % 3],
       CASE WHEN i % 10 = 0 THEN NULL WHEN i % 2 = 0 THEN 'female' ELSE 'male' END,
       CASE WHEN i % 7 = 0 THEN NULL ELSE 35 + (i % 20) * 0.5 END,
       170 + i % 60,
       ARRAY[i % 5, i % 7, i % 11]::real[]
FROM generate_series(1, 344) i;

-- A time series: weekly readings per station, some missing.
CREATE TABLE co2 (
    station int NOT NULL,
    week date NOT NULL,
    ppm real,                 -- NULL where the station was down
    PRIMARY KEY (station, week)
);
INSERT INTO co2
SELECT s, date '2020-01-06' + 7 * w, CASE WHEN (s + w) % 13 = 0 THEN NULL ELSE 410 + s + w * 0.05 END
FROM generate_series(1, 4) s, generate_series(0, 155) w;
